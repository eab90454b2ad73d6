"""`python -m pipeline.factory [--root DIR] [--force] [NAME ...]`: build the tiny models (pipeline.factory.tiny)."""
import sys

from pipeline.factory.tiny import main

sys.exit(main())
