#!/usr/bin/env bash
# Prints the device the environments are built for: cpu or cuda. PIPELINE_DEVICE=cpu|cuda decides (an image built
# without a GPU attached); otherwise cuda when `nvidia-smi -L` lists a GPU, else cpu.
set -euo pipefail
case "${PIPELINE_DEVICE:-}" in
    cpu|cuda) echo "$PIPELINE_DEVICE" ;;
    "") if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then echo cuda; else echo cpu; fi ;;
    *) echo "PIPELINE_DEVICE=$PIPELINE_DEVICE: must be cpu or cuda" >&2; exit 2 ;;
esac
