"""Policies. Learned ones are `torch.nn.Module`s following `wmrl.core.protocols.Policy`."""
