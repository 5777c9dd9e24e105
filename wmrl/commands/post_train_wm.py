"""`wmrl post-train-wm --world-model RUN --out RUN2`: post-train a video world model on its own long rollouts
(PersistWorld with the DiffusionNFT objective, or `--objective forcing`: the training loss on the recorded future
with the model's own rollout as context). The loop is `world_models.video.post_train`."""

from world_models.video.post_train import PostTrainWMConfig, post_train_world_model

__all__ = ["PostTrainWMConfig", "post_train_world_model"]
