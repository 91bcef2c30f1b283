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
// # Python workers and native code
//
// Getters and metrics are OSWorld's own Python, run from the user's
// checkout by a Pool: a few long-lived Python processes (workers) shared by
// the graders of every desktop of a batch, each running the bridge, a
// small standard-library-only program embedded in the binary. A pool
// starts its workers when it is made, so that they are ready before the
// first grade; each imports every evaluator module before taking work (a
// module whose dependencies are missing disables only its own metrics).
// The checkout's bytecode is compiled once into a persistent directory
// (PoolConfig.BytecodeDir); everything else uses the bytecode its
// distribution ships. A worker whose process dies, or hangs past
// GraderConfig.Timeout, is killed with everything it started and replaced,
// and the grade it was running is tried once more before it fails as an
// env error naming the metric. The bridge builds the env object OSWorld's
// getters read: vm_ip, server_port, chromium_port and vlc_port pointing at
// the desktop's forwarded ports, a per-task cache_dir, and a controller
// (get_file, execute_python_command, get_accessibility_tree, ...) talking
// HTTP to the guest server. A Grader without a Pool starts one of its own,
// of one worker, at its first grade through Python.
//
// The simplest and most used getters (vm_file, vm_command_line, rule,
// cloud_file, cache_file, accessibility_tree), those of the offline
// application tasks (vlc_playing_info, vlc_config, gimp_config_file,
// open_tabs_info, default_video_player: its 85 xdg-mime queries in one
// guest request) and their metrics (exact_match, check_include_exclude,
// match_in_list, is_in_list, literal_match, check_direct_json_object,
// compare_text_file, diff_text_file, is_vlc_playing, the check_qt_* and
// check_global_key_play_pause / check_one_instance_when_started_from_file
// VLC settings, check_config_status, is_expected_tabs) and the GNOME
// settings metrics of the os tasks (check_gnome_favorite_apps,
// check_text_enlarged) are also implemented in Go with CPython 3.11's
// semantics, down to where the Python code raises: str methods as package
// pystr gives them (the final sigma of str.lower, Unicode 14's tables),
// json.loads as decodePy does (NaN and Infinity, lone surrogates, the
// 4300-digit limit on ints), float() of a str as parseFloatText does
// (Unicode digits and space, underscores, "inf" and "nan"), eval() of
// gsettings' output as pyEvalStrings does. They run when no checkout is
// given, when its module does not import, or by choice (Mode).
// Evaluate says which way each metric ran. A task needing a metric or
// getter that is neither native nor importable is refused before the batch
// by Catalog.Check, naming the task and the metric; Check reports, before
// any desktop starts, which interpreter runs, what imports (or the module
// it lacks), what runs natively and how each task would be graded (the
// `legato rl grader` command).
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
//   - vlc_playing_info and open_tabs_info need the guest's VLC and DevTools
//     ports: a desktop without them is refused before the batch, where
//     OSWorld would score 0 (or launch a browser of its own).
//   - open_tabs_info lists the browser's page targets as DevTools reports
//     them (Target.getTargets: order and titles as they are at that moment);
//     OSWorld's Playwright waits for each page's network to go idle first.
//     When the browser does not answer it is an empty list: OSWorld first
//     launches a new browser and lists that one's tab. compare_urls uses the
//     public suffix list of golang.org/x/net (ICANN section), tldextract
//     its own copy.
//   - Each grade starts from an empty task cache directory, so a file left
//     by an earlier attempt (a postconfig output) is never graded again;
//     EvaluateAgain puts back what the last Evaluate's postconfig wrote
//     there. Cloud files are cached by URL in GraderConfig.DownloadDir.
//
// And where the native code cannot follow Python exactly: it follows
// CPython 3.11 (Unicode 14.0.0), so under another Python version the
// characters that version's Unicode added may lower, print or count as
// space differently; JSON nested deeper than 990 levels raises
// RecursionError natively, where CPython's limit depends on its caller's
// stack (about 990); sorted() with NaN among the values may order them
// otherwise than CPython's sort, which never changes a score (NaN equals no
// expected value). check_direct_json_object follows OSWorld's current code
// (the "__EVALUATION_FAILED__" marker, "ignore_list_order", a string
// matching one of a list); an older checkout through Python may score
// differently. Files are read as UTF-8, as Python does under a UTF-8
// locale. check_gnome_favorite_apps's eval() reads only a str, or a list
// or tuple of str literals (any quotes, prefixes u and r, Python's escapes,
// adjacent literals joined, comments, line continuations, a trailing
// comma), and raises CPython's SyntaxError or IndentationError on text that
// is certainly not Python ("@as []", "No such schema ...", nothing). Other
// Python fails the grade natively with an error saying so, where CPython
// would score it or raise something else: operators (['a'] + ['b']), names
// (true), numbers, None, nested or non-str elements, bytes and f-strings,
// \N{name} escapes, non-ASCII outside strings, comprehensions, and an
// indented line after such Python (IndentationError or SyntaxError,
// depending on what precedes it). The rule_relativeTime getter, and every
// getter and metric not listed above, run through Python only.
//
// # Re-grading
//
// Grade takes the task and the attempt's last action; the only attempt
// state a Grader holds is a copy of what each task's last postconfig run
// wrote on the host, which EvaluateAgain grades again instead of running
// the postconfig twice. Re-grading stored rollouts whose desktop state is
// available means a Grader whose Guest reads that state, a PostConfig that
// does nothing (the postconfig already ran), and the recorded last action
// (desktop.ParseAction of the last step's action string).
package grade
