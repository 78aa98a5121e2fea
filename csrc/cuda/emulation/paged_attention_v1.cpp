// Device-emulation build of ../paged_attention_v1.cu: the same file, compiled by the host
// compiler with PAGED_CUDA_EMULATION (see emulation.h). Nothing else here.
#include "../paged_attention_v1.cu"
