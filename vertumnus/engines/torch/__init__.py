"""The project's own PyTorch CP engine: long-lived rank processes running zigzag CP prefill (see
:mod:`vertumnus.engines.torch.data_plane`)."""
