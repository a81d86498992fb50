"""Import-path entry holding the `sgl_kernel` stand-in (see parse_sglang.cpu.enable)."""
