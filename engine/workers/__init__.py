"""Worker process groups (WPGs): long-lived Ray actors holding one backend each; jobs' states are
swapped into them, the WPG never moves."""
