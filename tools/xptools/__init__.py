"""Helpers shared by the Python tools in tools/ (fixture writers, checkers, seed runners,
benches). Scripts run as `python3 tools/NAME.py` find this package next to them (the
script's directory is the first entry of sys.path), so no path edits are needed.

- `seeds`: the seeds' program text extracted from shared/seeds/*.py.txt.
- `mxfp4`: the E2M1 value table and the DeepSeek MXFP4 (E2M1 x UE8M0) decoder in numpy.
"""
