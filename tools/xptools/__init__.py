"""Helpers shared by the Python tools under tools/ (the user tools beside this package, and
the checkers and seed runners in tools/peers/). A script in tools/ finds this package next
to it (the script's directory is the first entry of sys.path); a script in a subdirectory
puts tools/ on sys.path first: `sys.path.insert(0, str(Path(__file__).resolve().parents[1]))`.

- `seeds`: the seeds' program text extracted from shared/seeds/*.py.txt.
- `mxfp4`: the E2M1 value table and the DeepSeek MXFP4 (E2M1 x UE8M0) decoder in numpy.
"""
