"""User-style jobs and stand-ins the tests launch; they import nothing of the tool."""
