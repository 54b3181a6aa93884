#!/usr/bin/env bash
# Bazel workspace status (.bazelrc: --workspace_status_command). Prints the git
# revision for //version:stamped; prints nothing outside a git checkout (the
# revision then reads "unknown").
rev="$(git rev-parse --short=12 HEAD 2>/dev/null)" || exit 0
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  rev="${rev}-dirty"
fi
echo "STABLE_GIT_REVISION ${rev}"
