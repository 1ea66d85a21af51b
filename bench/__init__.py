"""keylane's benchmark harness: `make bench` writes bench-report.md, `make bench-gate` judges it."""
