/* Stands in for the NVIDIA driver's libcuda.so.1 in the variant-directory tests. */
#ifndef FAKE_CUDA_VERSION
#define FAKE_CUDA_VERSION 13000
#endif
__attribute__((visibility("default"))) int cuDriverGetVersion(int *version) {
    *version = FAKE_CUDA_VERSION;
    return 0;
}
