"""Import-path entry holding the `torchvision` stand-in (see sglang_cpu.enable)."""
