"""Moir Lab: self-generated preservation covariances for knowledge editing.

Reproduces and extends "Moir: Let the Model Direct Its Own Story for Robust
Cross-Domain Knowledge Editing". One module per concept of the paper; see
``DESIGN.md``-style map in the README.
"""

__version__ = "0.1.0"
