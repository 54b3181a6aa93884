#!/bin/sh
echo "coverage is not supported in the offline hicached build" >&2
exit 1
