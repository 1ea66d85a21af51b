"""Not a package: keylane's code lives in service/keylane/ and is imported as ``keylane``.

This file exists so that ``import service`` from the repository root fails with a clear
message instead of silently importing an empty namespace package.
"""

raise ImportError("keylane's package is `keylane` (service/keylane/): import keylane, not service")
