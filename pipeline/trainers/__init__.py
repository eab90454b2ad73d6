"""Trainers' own command lines with this project's pieces plugged in (run in the trainer's environment)."""
