"""JUnit XML for a matrix result: one test case a cell, so CI shows each cell.

A cell whose expectation fails is a <failure>; a cell whose runs could not
run (verdict `error`) is an <error>. Runs, divergences and the first differing
step go in as properties, where CI test viewers show them.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from bisect_prefetch.files import write_bytes_atomic
from bisect_prefetch.report.table import fmt_step

# Characters XML 1.0 cannot hold at all (not even as a reference): a cell name or a log
# excerpt holding one would make the whole file unreadable to CI.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml(value: object) -> str:
    """value as text XML can hold: characters it cannot are written as escapes."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _failure_message(cell: dict) -> str:
    if cell["verdict"] == "error":  # no verdict: why, as the group said it
        why = cell.get("reason") or (cell.get("group") or {}).get("reason") or "no reason given"
        return f"expected {cell['expect']}, got no verdict: {why}"
    got = cell["verdict"]
    if cell.get("first_diff_step") is not None:
        got += f" at step {cell['first_diff_step']}"
    return f"expected {cell['expect']}, got {got} ({cell['divergences']} of {cell['runs']} runs diverged)"


def _testcase(suite: ET.Element, cell: dict, classname: str) -> None:
    case = ET.SubElement(suite, "testcase", name=_xml(cell["name"]), classname=_xml(classname),
                         time=f"{float(cell.get('seconds') or 0.0):.3f}")
    props = ET.SubElement(case, "properties")
    for name, value in (("runs", cell["runs"]), ("divergences", cell["divergences"]),
                        ("first_diff_step", fmt_step(cell.get("first_diff_step"))),
                        ("verdict", cell["verdict"]), ("expect", cell["expect"]),
                        ("mask", ",".join(cell.get("mask") or []))):
        ET.SubElement(props, "property", name=name, value=_xml(value))
    if cell["expectation_met"]:
        return
    kind = "error" if cell["verdict"] == "error" else "failure"
    element = ET.SubElement(case, kind, message=_xml(_failure_message(cell)),
                            type=f"expectation-{kind}")
    element.text = _xml("\n".join(
        f"{name}: first diff step {fmt_step(stats.get('first_diff_step'))}, "
        f"max abs {stats.get('max_abs')}"
        for name, stats in (cell.get("metrics") or {}).items()
    ))


def matrix_junit(result: dict) -> bytes:
    cells = result["cells"]
    name = result.get("matrix") or "matrix"
    failed = [c for c in cells if not c["expectation_met"]]
    errors = sum(1 for c in failed if c["verdict"] == "error")
    total_time = sum(float(c.get("seconds") or 0.0) for c in cells)
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name=_xml(name), tests=str(len(cells)),
                          failures=str(len(failed) - errors), errors=str(errors),
                          skipped="0", time=f"{total_time:.3f}")
    for cell in cells:
        _testcase(suite, cell, classname=f"bisect-prefetch.{name}")
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(result: dict, path: Path) -> None:
    write_bytes_atomic(path, matrix_junit(result))
