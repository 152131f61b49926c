"""SkipDecode Studio, the Gradio app: `studio` runs things, `views` and `plots` draw them, `layout` wires
the page, `callbacks` connect the two. `python app.py` at the repository root serves it."""
