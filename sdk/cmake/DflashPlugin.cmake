# Functions for building dflash-host plugins. Used in-tree by dflash-host's own
# plugins and installed with the SDK for out-of-tree plugins, so both are
# built the same way.

# dflash_torch_cuda_version(<out-var>)
# The CUDA variant of the LibTorch found by find_package(Torch): "none" for a
# CPU-only build, "<major>.<minor>" otherwise. Plugins and the host both record
# it (DFLASH_TORCH_CUDA_VERSION) and the host refuses a mismatch at load.
function(dflash_torch_cuda_version out)
  set(cuda "none")
  if(TARGET torch_cuda OR TARGET c10_cuda OR "${TORCH_LIBRARIES}" MATCHES "c10_cuda|torch_cuda")
    if(CUDAToolkit_VERSION_MAJOR)
      set(cuda "${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR}")
    elseif(CUDA_VERSION)
      set(cuda "${CUDA_VERSION}")
    else()
      set(cuda "unknown")
    endif()
  endif()
  set(${out} "${cuda}" PARENT_SCOPE)
endfunction()

# dflash_use_torch(<target> <PRIVATE|PUBLIC>)
# Links LibTorch and records its build in DFLASH_TORCH_CUDA_VERSION.
function(dflash_use_torch target scope)
  if(NOT TORCH_LIBRARIES)
    find_package(Torch REQUIRED)
  endif()
  dflash_torch_cuda_version(cuda)
  if(DFLASH_HOST_TORCH_VERSION AND NOT "${Torch_VERSION}/${cuda}" STREQUAL "${DFLASH_HOST_TORCH_VERSION}/${DFLASH_HOST_TORCH_CUDA_VERSION}")
    message(FATAL_ERROR "${target}: found LibTorch ${Torch_VERSION} (CUDA: ${cuda}) at ${Torch_DIR}, but the installed "
      "dflash-host was built with LibTorch ${DFLASH_HOST_TORCH_VERSION} (CUDA: ${DFLASH_HOST_TORCH_CUDA_VERSION}); "
      "the host would refuse this plugin. Point CMAKE_PREFIX_PATH (or Torch_DIR) at the host's LibTorch.")
  endif()
  target_link_libraries(${target} ${scope} ${TORCH_LIBRARIES})
  target_compile_definitions(${target} ${scope} DFLASH_TORCH_CUDA_VERSION="${cuda}")
endfunction()

# dflash_add_plugin(<target> SOURCES <src>... [NO_TORCH] [OUTPUT_DIRECTORY <dir>])
# Builds one plugin library (a MODULE: loaded with dlopen, never linked).
# NO_TORCH: the library deals in DLPack only and does not link LibTorch.
# Symbols are hidden except the entry point the SDK's macro exports.
function(dflash_add_plugin target)
  cmake_parse_arguments(ARG "NO_TORCH" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "dflash_add_plugin(${target}): SOURCES is empty")
  endif()
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE dflash::sdk)
  set_target_properties(${target} PROPERTIES
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH_USE_LINK_PATH TRUE
    CXX_STANDARD 17
    CXX_STANDARD_REQUIRED ON)
  if(NOT ARG_NO_TORCH)
    dflash_use_torch(${target} PRIVATE)
  endif()
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIRECTORY}")
  elseif(DFLASH_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${DFLASH_PLUGIN_OUTPUT_DIR}")
  endif()
endfunction()
