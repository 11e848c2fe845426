"""Worker backends (sim, torch, vllm) implementing vertumnus.interfaces.DataPlane."""
