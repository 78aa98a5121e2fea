// Device-emulation build of ../cache_ops.cu: the same file, compiled by the host
// compiler with PAGED_CUDA_EMULATION (see emulation.h). Nothing else here.
#include "../cache_ops.cu"
