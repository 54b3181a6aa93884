#!/usr/bin/python3
"""Runs unittest modules and writes one JUnit <testcase> per test to
$XML_OUTPUT_FILE, so Bazel (and tools/test_summary.py) count Python tests
individually. Exit status 0 only if every test passed."""

import sys
import time
import unittest
import os
import xml.etree.ElementTree as ET


class Recorder(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []
        self._start = 0.0

    def startTest(self, test):
        self._start = time.time()
        super().startTest(test)

    def _record(self, test, outcome, text=""):
        self.records.append((test.id(), outcome, text, time.time() - self._start))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "ok")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)


def main(modules):
    suite = unittest.defaultTestLoader.loadTestsFromNames(modules)
    runner = unittest.TextTestRunner(resultclass=Recorder, verbosity=2)
    result = runner.run(suite)
    root = ET.Element("testsuites")
    suite_el = ET.SubElement(root, "testsuite", name="python", tests=str(len(result.records)))
    for test_id, outcome, text, seconds in result.records:
        cls, _, name = test_id.rpartition(".")
        case = ET.SubElement(suite_el, "testcase", classname=cls, name=name,
                             time=f"{seconds:.3f}")
        if outcome in ("failure", "error"):
            ET.SubElement(case, outcome, message=text.splitlines()[-1] if text else "").text = text
        elif outcome == "skipped":
            ET.SubElement(case, "skipped", message=text)
    out = os.environ.get("XML_OUTPUT_FILE")
    if out:
        ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    return 0 if result.wasSuccessful() and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
