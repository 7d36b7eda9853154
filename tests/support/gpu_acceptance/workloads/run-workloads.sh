#!/bin/sh
# Runs in the acceptance container (busybox sh; the image is Debian's glibc, busybox and the workloads): each
# workload's output between "=== BEGIN name" and "=== END name rc=N", read by tests/support/gpu_acceptance.
# Arguments: the workloads to run (default: all). Nothing here helps the driver's files be found: PATH is the
# image's, and no ldconfig or LD_LIBRARY_PATH is set, so what runs found its files where the CDI spec put them.
dir=/opt/gpu-acceptance
run() {
    name=$1
    shift
    echo "=== BEGIN $name"
    "$@" 2>&1
    echo "=== END $name rc=$?"
}
where_smi() {
    echo "path=$(command -v nvidia-smi || echo none)"
    for candidate in /usr/bin /usr/local/nvidia/bin /usr/local/bin /bin /usr/sbin; do
        [ -e "$candidate/nvidia-smi" ] && echo "found=$candidate/nvidia-smi"
    done
    [ -e /etc/ld.so.cache ] && echo "ld_so_cache=yes" || echo "ld_so_cache=no"
    return 0
}
[ $# -gt 0 ] || set -- env where nvidia-smi cuda opencl egl shm
for workload in "$@"; do
    case $workload in
    env) run env env ;;
    where) run where where_smi ;;
    nvidia-smi) run nvidia-smi nvidia-smi -L ;;
    cuda) run cuda "$dir/cuda-ptx" ;;
    opencl) run opencl "$dir/opencl-probe" ;;
    egl) run egl "$dir/egl-probe" ;;
    shm) run shm ls -la /dev/shm ;;
    true) run true true ;;
    *) echo "unknown workload $workload"; exit 2 ;;
    esac
done
