# Sourced by the build scripts (setup.sh, test.sh, dev_build.sh, sanitize.sh): ccache, when
# installed, for every CMake build folder that does not exist yet (CMake reads the variable at a
# folder's first configure), including pip's build/<wheel tag>. The base dir makes the cached
# paths relative, so worktrees of the repository and a clean clone's rebuilds share objects.
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="$(pwd)"
fi
