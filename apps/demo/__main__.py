"""Run the demo bundle once on a fixed input and check it against the numpy reference:
``python -m apps.demo BUNDLE [--emulate]`` (``--emulate`` for an npu1 / npu2 bundle)."""

import sys

import numpy as np

import iron
from iron.errors import IronError
from iron.pipeline.bundle import Bundle


def main(path: str, emulate: bool = False) -> int:
    bundle = Bundle.open(path)
    try:
        exe = bundle.executable("block", emulate=emulate)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    x = np.linspace(-1, 1, bundle.meta["dim"], dtype=np.float32).reshape(1, -1)
    x = x.astype(iron.bfloat16)
    (out,) = exe.run([x])
    (ref,) = bundle.program("block").reference([x], bundle.weights())
    err = float(np.max(np.abs(out.astype(np.float32) - ref.astype(np.float32))))
    print(f"demo block: out[:4] = {out[0, :4].astype(np.float32)}, max |out - reference| = "
          f"{err:.3g}")
    return 0 if err < 0.05 else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1], "--emulate" in sys.argv[2:]))
    except iron.IronError as e:
        sys.exit(f"error: {e}")
