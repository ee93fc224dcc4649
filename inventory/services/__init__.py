"""Domain writes of the inventory. Views stay thin and call these; each public function is one transaction."""
