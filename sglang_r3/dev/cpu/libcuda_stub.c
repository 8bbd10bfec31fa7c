/* The CUDA build of sgl-kernel links against libcuda.so.1 for exactly one
 * driver symbol. On a CPU-only host nothing ever calls it with a device
 * pointer, so answering "not initialized" lets the library load. */
typedef int CUresult;
#define CUDA_ERROR_NOT_INITIALIZED 3
CUresult cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) {
    (void)data; (void)attribute; (void)ptr;
    return CUDA_ERROR_NOT_INITIALIZED;
}
