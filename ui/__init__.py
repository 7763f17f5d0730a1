"""The Gradio playground (issue: the playground). Knows nothing of PyTorch; talks to an engine."""
