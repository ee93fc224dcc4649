"""Domain writes of the gangs app. Views and tasks stay thin and call these.

Each public function is one transaction (or says why not) and asks for work only after commit.
"""
