"""SkipDecode Studio: `python app.py` serves the app (this is also the Hugging Face Spaces entry point).

Listens on 127.0.0.1:7860 by default; on 0.0.0.0 on Spaces (SPACE_ID set) or when GRADIO_SERVER_NAME
says so. The model loads before the server starts, so the first click does not wait for it.
"""

from __future__ import annotations

import argparse
import os

from app.layout import CSS, build, theme
from app.studio import Limits, Studio
from skipdecode.batcher import DEFAULT_WINDOW_S, Batcher

QUEUE_SIZE = 64  # requests waiting beyond this are told the app is busy
WINDOW_ENV = "SKIPDECODE_BATCH_WINDOW_S"  # how long an idle server waits for requests to batch together


def server_name() -> str:
    if os.environ.get("GRADIO_SERVER_NAME"):
        return os.environ["GRADIO_SERVER_NAME"]
    return "0.0.0.0" if os.environ.get("SPACE_ID") else "127.0.0.1"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=server_name())
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    args = parser.parse_args(argv)
    limits = Limits()
    window = float(os.environ.get(WINDOW_ENV, DEFAULT_WINDOW_S))
    studio = Studio(limits=limits, batcher=Batcher(window_s=window, time_limit_s=limits.time_limit_s))
    studio.engine()  # load the default model now
    demo = build(studio)
    demo.queue(max_size=QUEUE_SIZE)
    demo.launch(server_name=args.host, server_port=args.port, theme=theme(), css=CSS, show_error=False,
                ssr_mode=False, footer_links=["api", "gradio"])


if __name__ == "__main__":
    main()
