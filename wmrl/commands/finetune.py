"""`wmrl finetune --algo wsrl|naive|naive-retain --agent RUN`: offline-to-online fine-tuning (WSRL). The algorithm is
`wmrl.rl.wsrl`."""

from wmrl.rl.wsrl import FinetuneConfig
from wmrl.rl.wsrl import finetune as _finetune


def finetune(cfg: FinetuneConfig) -> dict:
    return {k: v for k, v in _finetune(cfg).items() if k != "curve"}  # the curve is in the run folder


__all__ = ["FinetuneConfig", "finetune"]
