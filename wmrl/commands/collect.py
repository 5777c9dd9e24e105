"""`wmrl collect`: record scripted-expert (or learned-policy) episodes on a task into a LeRobot v3 dataset."""

from wmrl.eval.record import CollectConfig, collect

__all__ = ["CollectConfig", "collect"]
