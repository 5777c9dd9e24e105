"""`wmrl datasets make --env E --kind K --out DIR`: a D4RL-style state dataset made locally (SAC online, then the
policies D4RL names). The recipe is `wmrl.rl.d4rl`."""

from wmrl.rl.d4rl import MakeDatasetConfig, make_dataset

__all__ = ["MakeDatasetConfig", "make_dataset"]
