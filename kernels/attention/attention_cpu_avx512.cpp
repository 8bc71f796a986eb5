// The blocked fused forward in AVX-512 vectors: this file is compiled with -march=x86-64-v4
// (kernels/CMakeLists.txt) and runs only where the CPU has it (cpu_fused_kernel in attention_cpu.cpp).
#define TB_BLOCKED_ISA avx512
#if defined(__AVX512F__) && defined(__AVX512VL__)
#define TB_BLOCKED_WIDTH 16
#endif
#include "attention_cpu_blocked.inc"
