"""The README's screenshots (docs/images/*.png) in 256 colours: a third of their bytes, which keeps the
repository's tracked files under 60 MB with every served adapter in it. `make screenshots` runs it after
taking them; an image already in a palette is left as it is.

    python scripts/shrink_images.py [FOLDER]
"""

import sys
from pathlib import Path

from PIL import Image


def shrink(path: Path) -> tuple[int, int]:
    """Rewrite `path` with an adaptive palette of 256 colours; (bytes before, bytes after)."""
    before = path.stat().st_size
    with Image.open(path) as image:
        if image.mode == "P":
            return before, before
        small = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(path, optimize=True)
    return before, path.stat().st_size


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["docs/images"])[0])
    total = [0, 0]
    for path in sorted(folder.glob("*.png")):
        before, after = shrink(path)
        total[0] += before
        total[1] += after
    print(f"{folder}: {total[0] / 1e6:.2f} MB -> {total[1] / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
