# The tests of an installed trainbench (configured with -DTRAINBENCH_INSTALL_TESTS=ON), for a GPU node
# the install folder was copied to: `ctest --test-dir <prefix>/tests --output-on-failure`.
#
# The build tree's ctest files hold absolute paths, so they cannot travel. This one finds the test
# binaries beside itself when ctest reads it and lists each one's GoogleTest cases, so every case is
# its own ctest test, as in the build tree, and a case that skips (no usable CUDA device) is reported
# as skipped, not passed.
# ctest reads this file from its own folder (and defines no CMAKE_CURRENT_LIST_DIR here): a relative
# glob finds the binaries beside it, with absolute paths.
file(GLOB _tb_binaries LIST_DIRECTORIES false "test_*")
list(SORT _tb_binaries)
foreach(_tb_binary IN LISTS _tb_binaries)
  get_filename_component(_tb_name "${_tb_binary}" NAME)
  execute_process(COMMAND "${_tb_binary}" --gtest_list_tests
                  OUTPUT_VARIABLE _tb_listing ERROR_VARIABLE _tb_error RESULT_VARIABLE _tb_rc TIMEOUT 120)
  if(NOT _tb_rc EQUAL 0)
    # A binary that cannot even list its tests (a missing library, say) is one failing test.
    add_test("${_tb_name}.list" "${_tb_binary}" --gtest_list_tests)
    continue()
  endif()
  string(REPLACE "\n" ";" _tb_lines "${_tb_listing}")
  set(_tb_suite "")
  foreach(_tb_line IN LISTS _tb_lines)
    string(REGEX REPLACE "[ \t]*#.*$" "" _tb_line "${_tb_line}")  # "  # GetParam() = ..." comments
    if(_tb_line MATCHES "^  +([^ ]+)$")
      set(_tb_case "${_tb_suite}${CMAKE_MATCH_1}")
      # A disabled case would run nothing and pass: the build tree runs those that matter by name
      # (tests/CMakeLists.txt), and they are CPU-only.
      if(_tb_case MATCHES "(^|\\.)DISABLED_")
        continue()
      endif()
      add_test("${_tb_case}" "${_tb_binary}" "--gtest_filter=${_tb_case}")
      set_tests_properties("${_tb_case}" PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]" TIMEOUT 600
                           LABELS "${_tb_name}")
      # The harness's own cases time toy CPU variants and give a disturbed row no ratio: beside the
      # other tests (ctest -j on a GPU node) their rows are disturbed and the pair they check is withheld.
      if(_tb_case MATCHES "^Harness\\.")
        set_tests_properties("${_tb_case}" PROPERTIES RUN_SERIAL TRUE)
      endif()
    elseif(_tb_line MATCHES "^([^ ]+\\.)$")
      set(_tb_suite "${CMAKE_MATCH_1}")
    endif()
  endforeach()
endforeach()
