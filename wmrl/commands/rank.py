"""`wmrl rank --policies SPEC ... --world-model RUN`: rank policies in the world model and in the true simulator and
measure their agreement (Ctrl-World, WorldEval). The protocol is `wmrl.eval.rank`."""

from wmrl.eval.rank import RankConfig, run_rank

__all__ = ["RankConfig", "run_rank"]
