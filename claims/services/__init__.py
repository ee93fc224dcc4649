"""Domain writes of the claims app. Views and tasks stay thin and call these.

Each public function is one transaction (or documents why not), and enqueues work only after commit.
"""
