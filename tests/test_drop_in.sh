#!/bin/sh
# Builds examples/c_drop_in the way a C user would (make + cc, and nvcc when present) in a
# scratch directory, and runs what it built. Then the installed library: `meson install` of this
# build into a scratch DESTDIR, the example built against it through pkg-config (without
# FUSEDK_IMPLEMENTATION) and run in an empty environment (no LD_LIBRARY_PATH): the .pc file's
# rpath finds libfusedk, libfusedk's own rpath finds the CUDA runtime.
#   test_drop_in.sh SOURCE_ROOT OUT_DIR   (OUT_DIR inside the meson build tree, e.g. build/tests/drop_in)
set -eu
src=$1/examples/c_drop_in
out=$2
mkdir -p "$out"
make -s -C "$src" FUSEDK="$1" OUT="$out" cpu
"$out/demo_cpu"
if command -v nvcc >/dev/null 2>&1; then
  make -s -C "$src" FUSEDK="$1" OUT="$out" GENCODE="-gencode=arch=compute_90a,code=sm_90a" gpu
  "$out/demo_gpu"
else
  echo "nvcc not found: GPU drop-in build not tried"
fi

build=$(cd "$out/../.." && pwd)
if ! [ -f "$build/meson-private/install.dat" ]; then
  echo "$build is not a meson build tree: install not tried"; exit 0
fi
if ! command -v meson >/dev/null 2>&1 || ! command -v pkg-config >/dev/null 2>&1; then
  echo "meson or pkg-config not on PATH: install not tried"; exit 0
fi
dest=$out/destdir
rm -rf "$dest"
meson install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$out/install.log" 2>&1 ||
  { cat "$out/install.log"; exit 1; }
pc=$(find "$dest" -name fusedk.pc | head -n 1)
[ -n "$pc" ] || { echo "fusedk.pc not installed"; exit 1; }
# the .pc as installed, its prefix moved under DESTDIR (${libdir} and ${includedir} follow it)
mkdir -p "$out/pc"
sed "s|^prefix=.*|prefix=$dest$(sed -n 's/^prefix=//p' "$pc")|" "$pc" >"$out/pc/fusedk.pc"
pcflags=$(PKG_CONFIG_PATH=$out/pc pkg-config --cflags --libs fusedk)
echo "pkg-config --cflags --libs fusedk: $pcflags"
case $pcflags in *-Wl,-rpath,*) ;; *) echo "no rpath in the .pc Libs"; exit 1 ;; esac
rm -f "$out/demo_installed"
PKG_CONFIG_PATH=$out/pc make -s -C "$src" OUT="$out" installed
env -i PATH=/usr/bin:/bin "$out/demo_installed"
lib=$(env -i PATH=/usr/bin:/bin ldd "$out/demo_installed" | sed -n 's/.*libfusedk[^ ]* => \([^ ]*\).*/\1/p')
case $lib in "$dest"/*) echo "libfusedk from $lib" ;; *) echo "libfusedk resolved to '$lib', not the installed one"; exit 1 ;; esac
if env -i PATH=/usr/bin:/bin ldd "$lib" | grep -q 'libcudart.*not found'; then echo "installed libfusedk does not find libcudart"; exit 1; fi
if command -v readelf >/dev/null 2>&1 && readelf -d "$lib" | grep -q 'NEEDED.*libcudart'; then
  rp=$(readelf -d "$lib" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p;s/.*(RPATH).*\[\(.*\)\]/\1/p')
  [ -n "$rp" ] || { echo "installed libfusedk has no rpath to the CUDA runtime"; exit 1; }
  echo "installed libfusedk rpath: $rp"
fi
