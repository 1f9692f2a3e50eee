"""One self-contained HTML report of an evaluation or a training run, or a comparison of several: Bokeh charts,
the outcome of every episode, the tasks that flipped, and a transcript viewer (``examples/report.py``)."""
