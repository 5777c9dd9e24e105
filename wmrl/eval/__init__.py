from wmrl.eval.loop import EvalResult, evaluate, wilson_interval

__all__ = ["EvalResult", "evaluate", "wilson_interval"]
