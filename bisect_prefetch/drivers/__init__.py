"""What drives many runs for a command: the real oracle, the slots it fills, an A/A group.

Each driver asks runs/ (the Runner) for runs and hears them finish; runs/ never imports a driver.
"""
