#!/usr/bin/python3
"""Counts test cases from Bazel's test.xml files and prints 'N passed, N failed'.

Usage: test_summary.py TESTLOGS_DIR TARGET...

Each target's bazel-testlogs/<package>/<name>/test.xml is read (a sharded
target's shard_K_of_N/test.xml, every one of them). GoogleTest
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


def xml_files(target_dir):
    """The target's test.xml, or each shard's (shard_K_of_N/test.xml),
    whichever the latest run wrote (a target may have been sharded since)."""
    whole = os.path.join(target_dir, "test.xml")
    shards = []
    if os.path.isdir(target_dir):
        for entry in sorted(os.listdir(target_dir)):
            path = os.path.join(target_dir, entry, "test.xml")
            if entry.startswith("shard_") and os.path.exists(path):
                shards.append(path)
    if not os.path.exists(whole):
        return shards
    if shards and max(os.path.getmtime(p) for p in shards) > os.path.getmtime(
            whole):
        return shards
    return [whole]


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    testlogs, targets = argv[1], argv[2:]
    passed = failed = skipped = 0
    for target in targets:
        package, _, name = target.lstrip("/").partition(":")
        xml_paths = xml_files(os.path.join(testlogs, package, name))
        if not xml_paths:
            print("FAILED: %s (no results: did it build?)" % target,
                  file=sys.stderr)
            failed += 1
            continue
        p = f = s = 0
        names = []
        for xml_path in xml_paths:
            try:
                tp, tf, ts, tnames = count_target(xml_path)
            except ET.ParseError as e:
                print("unreadable %s: %s" % (xml_path, e), file=sys.stderr)
                tf, tnames = 1, []
                tp = ts = 0
            p, f, s, names = p + tp, f + tf, s + ts, names + tnames
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
