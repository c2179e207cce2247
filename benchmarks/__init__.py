"""Reproducible measurements (not tests): each prints a table and writes results/."""
