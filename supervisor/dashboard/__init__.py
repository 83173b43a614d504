"""The live web dashboard: one page over the board, the event cursor and the supervisor's state."""
