"""`wmrl finetune --algo wsrl|naive|naive-retain --agent RUN`: offline-to-online fine-tuning (WSRL). The algorithm is
`wmrl.rl.wsrl`."""

from wmrl.rl.wsrl import FinetuneConfig, finetune

__all__ = ["FinetuneConfig", "finetune"]
