#!/bin/bash
# A plain shell payload: it runs on the allocated node (or locally) and writes to stdout.
echo "report from $(hostname) at $(date -u +%FT%TZ)"
echo "working directory: $PWD"
