"""Jinja2 templates of the K2 kernel in LLVM IR (package data)."""
