#!/usr/bin/python3
"""Counts test cases from Bazel's test.xml files and prints 'N passed, N failed'.

Usage: test_summary.py TESTLOGS_DIR TARGET...

Each target's bazel-testlogs/<package>/<name>/test.xml is read. GoogleTest
writes one <testcase> per test; for tests that write no XML (shell tests, or a
binary that crashed) Bazel writes one <testcase> for the whole target, with a
<failure> or <error> when it failed. A target without any test.xml (it failed
to build or never ran) counts as one failure. Skipped cases are reported
separately and count as neither passed nor failed.

Exit status: 0 when nothing failed and something passed, 1 otherwise.
"""

import os
import sys
import xml.etree.ElementTree as ET


def count_target(xml_path):
    """Returns (passed, failed, skipped, failed_case_names) for one test.xml."""
    passed = failed = skipped = 0
    failures = []
    root = ET.parse(xml_path).getroot()
    for case in root.iter("testcase"):
        name = "%s.%s" % (case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failures.append(name)
        elif (case.find("skipped") is not None or
              case.get("result") == "skipped" or
              case.get("status") == "notrun"):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failures


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    testlogs, targets = argv[1], argv[2:]
    passed = failed = skipped = 0
    for target in targets:
        package, _, name = target.lstrip("/").partition(":")
        xml_path = os.path.join(testlogs, package, name, "test.xml")
        if not os.path.exists(xml_path):
            print("FAILED: %s (no results: did it build?)" % target,
                  file=sys.stderr)
            failed += 1
            continue
        try:
            p, f, s, names = count_target(xml_path)
        except ET.ParseError as e:
            print("unreadable %s: %s" % (xml_path, e), file=sys.stderr)
            failed += 1
            continue
        for n in names:
            print("FAILED: %s %s" % (target, n), file=sys.stderr)
        if names:
            print("FAILED-LOG: %s" % os.path.join(testlogs, package, name,
                                                  "test.log"),
                  file=sys.stderr)
        passed, failed, skipped = passed + p, failed + f, skipped + s
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
