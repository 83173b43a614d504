"""The board's upkeep: pruning finished tasks and migrating a board between the file and PostgreSQL backends."""
