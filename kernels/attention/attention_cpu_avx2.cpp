// The blocked fused forward in AVX2 vectors with FMA: this file is compiled with -march=x86-64-v3
// (kernels/CMakeLists.txt) and runs only where the CPU has it (cpu_fused_kernel in attention_cpu.cpp).
#define TB_BLOCKED_ISA avx2
#if defined(__AVX2__) && defined(__FMA__)
#define TB_BLOCKED_WIDTH 8
#endif
#include "attention_cpu_blocked.inc"
