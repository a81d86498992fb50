"""Import-path entry holding the `flashinfer` stand-in (see sglang_cpu.enable_flashinfer_standin)."""
