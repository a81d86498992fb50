"""Import-path entry holding the `sgl_kernel` stand-in (see sglang_cpu.enable)."""
