"""inferledger.ledger"""
