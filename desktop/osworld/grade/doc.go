// Package grade computes an OSWorld task's reward the way OSWorld itself
// does (DesktopEnv.evaluate), for one desktop.
//
// # Semantics
//
// A Grader runs the evaluator's postconfig steps (through PostConfig, the
// desktop's setup controller), then: "infeasible" scores 1 exactly when the
// last action was FAIL; on any other task a final FAIL scores 0; one metric
// scores metric(result[, expected], **options), its arguments produced by
// getters get_<type>(env, config); a list of metrics is combined with
// "and" (0 at the first 0, else the mean) or "or" (1 at the first 1, else
// the maximum). A result getter that finds no file makes its metric score 0.
//
// # Bridge and native code
//
// Getters and metrics are OSWorld's own Python, run from the user's
// checkout (GraderConfig.OSWorldDir) by a long-lived Python process per
// desktop: the bridge, a small standard-library-only program embedded in
// the binary. It starts on the first grade that needs it, imports each
// evaluator module when first needed (a module whose dependencies are
// missing disables only its own metrics), is restarted after it dies, and
// is killed, with everything it started, when a grade exceeds
// GraderConfig.Timeout and on Close. It builds the env object OSWorld's
// getters read: vm_ip, server_port, chromium_port and vlc_port pointing at
// the desktop's forwarded ports, a per-task cache_dir, and a controller
// (get_file, execute_python_command, get_accessibility_tree, ...) talking
// HTTP to the guest server.
//
// The simplest and most used getters (vm_file, vm_command_line, rule,
// cloud_file, cache_file, accessibility_tree) and metrics (exact_match,
// check_include_exclude, match_in_list, is_in_list, literal_match,
// check_direct_json_object, compare_text_file, diff_text_file) are also
// implemented in Go with Python's semantics, down to where the Python code
// raises. They run when no checkout is given, when its module does not
// import, or by choice (Mode). A task needing a metric or getter that is
// neither native nor importable is refused before the batch by
// Catalog.Check, naming the task and the metric.
//
// # Where the reward may differ from OSWorld's
//
// All deliberate, to keep rewards trustworthy:
//   - A guest server that cannot be reached fails the grade (an env error)
//     where OSWorld's controller would hand the metric None and score 0.
//     Through the bridge, any guest request that could not connect during a
//     grade fails it.
//   - A result getter that finds no file scores its metric 0 in an "or"
//     list too, where OSWorld's code would reuse the previous metric's
//     value or crash.
//   - A native cache_file getter that finds no file scores 0; OSWorld's
//     asserts, which fails the grade.
//   - A null entry in a list of expected getters calls that metric without
//     an expected value; null options mean none (OSWorld would crash).
//   - Each grade starts from an empty task cache directory, so a file left
//     by an earlier attempt (a postconfig output) is never graded again.
//     Cloud files are cached by URL in GraderConfig.DownloadDir.
//
// And where the native code cannot follow Python exactly: str.lower() and
// white space match Python 3.11 for every code point (tested), repr() may
// escape characters assigned after Unicode 14 that Python 3.11 does not
// know; a result text with NaN or Infinity literals is not JSON to
// check_direct_json_object natively. check_direct_json_object follows
// OSWorld's current code (the "__EVALUATION_FAILED__" marker,
// "ignore_list_order", a string matching one of a list); an older checkout
// through the bridge may score differently. The rule_relativeTime getter,
// and every getter and metric not listed above, are bridge-only.
//
// # Re-grading
//
// A Grader holds no attempt state: Grade takes the task and the attempt's
// last action. Re-grading stored rollouts whose desktop state is available
// means a Grader whose Guest reads that state, a PostConfig that does
// nothing (the postconfig already ran), and the recorded last action
// (desktop.ParseAction of the last step's action string).
package grade
