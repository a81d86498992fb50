"""Import-path entry holding the `torchvision` stand-in (see parse_sglang.cpu.enable)."""
