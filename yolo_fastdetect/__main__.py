"""``python -m yolo_fastdetect ...``: the same commands as the ``yolo-fastdetect`` console script."""

from .cli import main

if __name__ == "__main__":
    main()
